"""The board's rows as rich Text cells: pure functions of the data, the clock and the width.

Shared by the live table and by ``render_text`` (``board --once``), so both always agree.
Every state is shown by a glyph, a colour and a word: colour alone fails colour-blind users
and plain terminals.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

from rich.text import Text

from gpuclaim.board.data import BoardData, Filters
from gpuclaim.board.service_cells import service_job_text, service_key, service_note
from gpuclaim.core.durations import format_duration
from gpuclaim.core.model import Claim
from gpuclaim.core.states import (
    FaceState,
    GpuState,
    JobState,
    face_state,
    face_style,
    started,
    style_of_face,
    unhandled,
)
from gpuclaim.engine.bookings import booking_phrase
from gpuclaim.engine.cluster import GpuRow
from gpuclaim.engine.launch import CLAIM_MARGIN_S

NARROW, MEDIUM, WIDE = "narrow", "medium", "wide"
PADDING = 1  # DataTable cell_padding: this many spaces each side of every cell
SCROLLBAR = 1  # the table's vertical scrollbar, always reserved so widths never jump
EMPTY = Text("")  # never changed: the table copies cells before touching them
MEMORY_WIDTH = {NARROW: 11, MEDIUM: 15, WIDE: 20}  # the MEMORY column: a bar, used/total
MEMORY_BAR = {NARROW: 4, MEDIUM: 7, WIDE: 11}
FREE_COLUMN = FaceState.FREE.value  # compact view: how many of a node's GPUs are free
# The summary line's counts after the free ones, in this order.
SUMMARY_STATES = (
    FaceState.CLAIMED,
    FaceState.BUSY_UNCLAIMED,
    FaceState.STALE,
    FaceState.DRAINED,
    FaceState.UNREACHABLE,
)


@dataclass(frozen=True)
class Face:
    """How the board shows a face besides its colour (core's face_style) and word."""

    glyph: str  # beside its word, and alone in the compact view
    meaning: str  # its line in the help screen's legend


def face(state: FaceState) -> Face:
    if state is FaceState.FREE:
        return Face("●", "nobody holds it and nothing runs on it")
    if state is FaceState.CLAIMED:
        return Face("■", "held by the user shown, until the time left runs out")
    if state is FaceState.BUSY_UNCLAIMED:
        return Face("▲", "processes run on it without a claim")
    if state is FaceState.STALE:
        return Face("◆", "an expired, abandoned or damaged claim: reclaimable")
    if state is FaceState.UNREACHABLE:
        return Face("✕", "the node did not answer; claims are still shown")
    if state is FaceState.RESERVED:
        return Face("◇", "free, inside someone's booking window: theirs alone")
    if state is FaceState.SHARED:
        return Face("◐", "held in parts by memory shares (--gpu-mem), room shown beside")
    if state is FaceState.DRAINED:
        return Face("○", "free, but its node takes no new claims (maintenance)")
    if state is FaceState.PROBING:
        return Face("…", "its node has not answered the board's first look yet")
    unhandled(state)


PREEMPTIBLE_MARK = " ⏏"  # after a holder's name: a preemptible job's, it yields to any claim


def holder_label(claim: Claim) -> str:
    """The holder cell's text: the user, marked when the claim is a preemptible job's."""
    return claim.user + (PREEMPTIBLE_MARK if claim.preemptible else "")


def glyph(state: FaceState) -> str:
    return face(state).glyph


def short_word(state: FaceState) -> str:
    """The word a face shows where columns are narrow."""
    return "busy" if state is FaceState.BUSY_UNCLAIMED else state.value


def glyph_of(value: str) -> str:
    """``glyph`` for a row's state string; ``?`` for a state this version does not know."""
    state = face_state(value)
    return "?" if state is None else glyph(state)


def reason_style(value: str) -> str:
    """A row's reason is shown in its state's colour; dim for a state this version does not
    know."""
    return style_of_face(value) or "dim"


@dataclass(frozen=True)
class Column:
    """One column of the board's table: its key, heading and width."""

    key: str
    label: str
    width: int
    right: bool = False


@dataclass(frozen=True)
class RowContext:
    """What every cell needs besides its row."""

    data: BoardData
    me: str
    clock_now: float  # the board's clock, for data ages
    refresh_s: float
    layout: str


def layout_for(width: int) -> str:
    return NARROW if width < 110 else MEDIUM if width < 170 else WIDE


def columns_for(
    width: int, rows: Sequence[GpuRow], compact: bool, node_names: Sequence[str] = ()
) -> list[Column]:
    """Columns that fit ``width``: details are dropped on narrow terminals, the note column
    takes what is left."""
    node_w = _fit([*node_names, *(r.node for r in rows)], 4, 14)
    holder_w = _fit([holder_label(r.claim) for r in rows if r.claim], 6, 14)
    if compact:
        cols = [Column("node", "NODE", node_w), Column("gpus", "GPUS", 16)]
        cols.append(Column(FREE_COLUMN, "FREE", 5, right=True))
        return _with_rest(cols, Column("who", "WHO HOLDS WHAT", 0), width)
    layout = layout_for(width)
    cols = [Column("node", "NODE", node_w), Column("gpu", "GPU", 3, right=True)]
    if layout != NARROW:
        cols.append(Column("model", "MODEL", 11 if layout == MEDIUM else 18))
    cols.append(Column("memory", "MEMORY", MEMORY_WIDTH[layout]))
    cols.append(Column("util", "UTIL", 4 if layout != WIDE else 9, right=layout != WIDE))
    cols.append(Column("state", "STATE", 16 if layout == WIDE else 13))
    cols.append(Column("holder", "HOLDER", holder_w))
    if layout != NARROW:
        cols.append(Column("held", "HELD", 6, right=True))
    cols.append(Column("left", "LEFT", 7, right=True))
    if layout == NARROW:
        return _with_rest(cols, Column("note", "JOB / NOTE", 0), width)
    cols.append(Column("job", "JOB", 12 if layout == MEDIUM else 20))
    return _with_rest(cols, Column("note", "NOTE", 0), width)


def _with_rest(cols: list[Column], last: Column, width: int) -> list[Column]:
    used = sum(c.width + 2 * PADDING for c in cols) + 2 * PADDING + SCROLLBAR
    return [*cols, Column(last.key, last.label, max(len(last.label), width - used))]


def _fit(values: Sequence[str], low: int, high: int) -> int:
    return max(low, min(high, max((len(v) for v in values), default=low)))


class CellMemo:
    """The cells of the last refresh, by what they were made from: most rows of a refresh
    are as they were, and making rich Text is most of a refresh's cost."""

    def __init__(self) -> None:
        self._cells: dict[Hashable, list[Text]] = {}
        self._next: dict[Hashable, list[Text]] = {}

    def get(self, key: Hashable, make: Callable[[], list[Text]]) -> list[Text]:
        cells = self._cells.get(key)
        if cells is None:
            cells = make()
        self._next[key] = cells
        return cells

    def done(self) -> None:
        """Keep only what this refresh used."""
        self._cells, self._next = self._next, {}


def table_rows(
    rows: Sequence[GpuRow],
    ctx: RowContext,
    columns: Sequence[Column],
    compact: bool,
    memo: Optional[CellMemo] = None,
) -> list[tuple[str, list[Text]]]:
    """(row key, cells) for every row given (see ``visible_rows``), in column order. With a
    memo, unchanged rows come back as the very same lists (cheap to compare)."""
    memo = memo or CellMemo()
    cols = tuple(columns)
    result = []
    for node, group in _groups(rows):
        age = data_age(node, ctx)
        if compact:
            lefts = tuple((_left_words(r, ctx), idle_for(r, ctx.data)) for r in group)
            key: Hashable = (node, tuple(group), age, lefts, ctx.me, cols)
            make = partial(node_cells, node, group, ctx, columns)
            result.append((node_key(node), memo.get(key, make)))
            continue
        for i, row in enumerate(group):
            words = (_left_words(row, ctx), _job_key(row, ctx), idle_for(row, ctx.data))
            key = (row, i, len(group), age, words, ctx.me)
            key = (key, ctx.layout, cols)
            make = partial(_gpu_cell_list, row, ctx, i, len(group), cols)
            result.append((row_key(row), memo.get(key, make)))
    memo.done()
    return result


def _gpu_cell_list(
    row: GpuRow, ctx: RowContext, position: int, size: int, columns: Sequence[Column]
) -> list[Text]:
    cells = gpu_cells(row, ctx, position, size)
    return [cells.get(c.key, EMPTY) for c in columns]


def _left_words(row: GpuRow, ctx: RowContext) -> tuple[str, str]:
    """What the row shows of time held and left: a new minute is a new row."""
    claim = row.claim
    if claim is None:
        b = row.booking  # a booking's window words change with the clock too
        return ("", booking_phrase(b, ctx.data.now)) if b is not None else ("", "")
    held = format_duration(ctx.data.now - claim.since)
    return (held, format_duration(time_left(claim, ctx.data)))


def time_left(claim: Claim, data: BoardData) -> float:
    """What a held GPU has left: for a job's GPU the job's own time, as ``gpuclaim jobs``
    says (its claim outlives the job's limit by CLAIM_MARGIN_S, kept for the kill grace);
    else the claim's."""
    job = data.jobs.get(claim.job) if claim.job else None
    if job is not None and job.ends is not None:
        return job.ends - data.now
    margin = CLAIM_MARGIN_S if claim.job else 0.0  # not started yet, or not known
    return claim.expires - margin - data.now


def _job_key(row: GpuRow, ctx: RowContext) -> Hashable:
    job_id = row.claim.job if row.claim else None
    if not job_id:
        return None
    job = ctx.data.jobs.get(job_id)
    service = ctx.data.services.get(job_id)
    shown = service_key(service, ctx.data.now) if service is not None else None
    return (job_id, job.name if job else None, ctx.data.job_states.get(job_id), shown)


def row_key(row: GpuRow) -> str:
    return row.uuid or node_key(row.node)


def node_key(node: str) -> str:
    return f"node:{node}"


def _groups(rows: Sequence[GpuRow]) -> list[tuple[str, list[GpuRow]]]:
    groups: list[tuple[str, list[GpuRow]]] = []
    for row in rows:
        if groups and groups[-1][0] == row.node:
            groups[-1][1].append(row)
        else:
            groups.append((row.node, [row]))
    return groups


def idle_for(row: GpuRow, data: BoardData) -> Optional[float]:
    """How long a held GPU's claim has sat idle, when it counts as idle (else None)."""
    if row.claim is None or row.state != GpuState.CLAIMED or row.claim.keep_when_idle:
        return None  # a service idles by design (at night): not worth a mark
    use = data.usage.get(row.claim.id)
    if not use or not use.get("idle"):
        return None
    return float(use.get("idle_for_s") or 0.0)


def display_state(row: GpuRow, data: BoardData) -> str:
    """The state shown: a free GPU on a drained node takes no claims, so it says so."""
    if row.state == GpuState.FREE and row.node in data.view.drains:
        return FaceState.DRAINED.value
    return row.state


def state_text(value: str, short: bool = False) -> Text:
    """A face's glyph and word in its colour; a state this version does not know is shown as
    it is, with ``?`` and no colour."""
    state = face_state(value)
    if state is None:
        return Text(f"? {value}", style="")
    word = short_word(state) if short else state.value
    return Text(f"{glyph(state)} {word}", style=face_style(state))


def gpu_cells(row: GpuRow, ctx: RowContext, position: int, group_size: int) -> dict[str, Text]:
    """One GPU row's cells by column key."""
    data, g, claim = ctx.data, row.gpu, row.claim
    state = display_state(row, data)
    stale_age = data_age(row.node, ctx)
    cells: dict[str, Text] = {
        "gpu": Text(row.label),
        "state": state_text(state, short=ctx.layout != WIDE),
    }
    idle = idle_for(row, data)
    if idle is not None:  # held but unused: the word says it, not only the colour
        cells["state"] = Text(
            f"{glyph(FaceState.CLAIMED)} idle {format_duration(idle)}", "yellow dim"
        )
    if position == 0:
        cells["node"] = Text(row.node, style="bold" if stale_age is None else "bold dim")
    elif position == 1 and stale_age is not None:
        cells["node"] = Text(f"⏱ {stale_age}", style="yellow")
    if g is not None:
        model = short_model(g.name) + (f" · {g.mig_profile}" if g.mig_profile else "")
        cells["model"] = Text(model, overflow="ellipsis")
        width, bar = MEMORY_WIDTH[ctx.layout], MEMORY_BAR[ctx.layout]
        cells["memory"] = memory_text(g.memory_used_mib, g.memory_total_mib, width, bar)
        cells["util"] = util_text(g.utilization_pct, 4 if ctx.layout == WIDE else 0)
    if claim is not None:
        mine = claim.user == ctx.me
        cells["holder"] = Text(claim.user, style="bold cyan" if mine else "")
        if claim.preemptible:  # it yields to anyone's claim: say so where the name is
            cells["holder"].append(PREEMPTIBLE_MARK, style="blue")
        cells["held"] = Text(format_duration(max(0.0, data.now - claim.since)))
        cells["left"] = left_text(time_left(claim, data), job=bool(claim.job))
        cells["job"] = job_text(claim.job, data)
    elif row.shares:  # held in parts: how many, and who (the note says each part)
        users = list(dict.fromkeys(c.user for c in row.shares))
        mine = ctx.me in users
        cells["holder"] = Text(f"{len(row.shares)} shares", style="bold cyan" if mine else "")
        soonest = min(row.shares, key=lambda c: c.expires)
        cells["left"] = left_text(time_left(soonest, data), job=bool(soonest.job))
    elif row.state == GpuState.RESERVED and row.booking is not None:
        mine = row.booking.user == ctx.me
        cells["holder"] = Text(row.booking.user, style="bold cyan" if mine else "cyan")
        cells["left"] = Text(format_duration(row.booking.end - data.now), style="cyan")
    cells["note"] = note_text(row, ctx, stale_age if group_size == 1 else None)
    if ctx.layout == NARROW and claim is not None and claim.job:
        cells["note"] = Text.assemble(job_text(claim.job, data), " ", cells["note"])
    return cells


def node_cells(
    node: str, rows: Sequence[GpuRow], ctx: RowContext, columns: Sequence[Column]
) -> list[Text]:
    """Compact mode: one line per node, a glyph per GPU and who holds what, in words."""
    data = ctx.data
    gpus = [r for r in rows if r.index is not None]
    stale_age = data_age(node, ctx)
    cells: dict[str, Text] = {
        "node": Text(node, style="bold" if stale_age is None else "bold dim"),
    }
    strip = Text()
    for r in gpus:
        state = display_state(r, data)
        mine = r.claim is not None and r.claim.user == ctx.me
        strip.append(glyph_of(state), style="bold cyan" if mine else style_of_face(state))
    if not gpus:
        strip = state_text(rows[0].state)
    cells["gpus"] = strip
    free = sum(1 for r in gpus if display_state(r, data) == FaceState.FREE)
    cells[FREE_COLUMN] = Text(
        f"{free}/{len(gpus)}" if gpus else "-", style="green" if free else "dim"
    )
    who = Text()
    if stale_age is not None:
        who.append(f"⏱ data {stale_age} old · ", style="yellow")
    if not gpus:
        who.append(rows[0].reason or "", style="dim")
    for i, (label, state, holder, left) in enumerate(_runs(gpus, data)):
        if i:
            who.append(" · ", style="dim")
        who.append(label + " ")
        if holder is not None:
            who.append(holder, style="bold cyan" if holder == ctx.me else "")
            if left is not None:
                who.append(f" {format_duration(left)}", style="dim")
        else:
            who.append_text(state_text(state, short=True))
    cells["who"] = who
    return [cells.get(c.key, EMPTY) for c in columns]


def _runs(
    rows: Sequence[GpuRow], data: BoardData
) -> list[tuple[str, str, Optional[str], Optional[float]]]:
    """Consecutive GPUs with the same state and holder: ("0-2", state, holder, least left)."""
    runs: list[tuple[list[GpuRow], str, Optional[str], Optional[float]]] = []
    for r in rows:
        state = display_state(r, data)
        holder = r.claim.user if r.claim else None
        left = time_left(r.claim, data) if r.claim else None
        if runs and runs[-1][1] == state and runs[-1][2] == holder:
            indices, _, _, old = runs[-1]
            indices.append(r)
            least = old if left is None or (old is not None and old < left) else left
            runs[-1] = (indices, state, holder, least)
        else:
            runs.append(([r], state, holder, left))
    return [(_span(ix), state, holder, left) for ix, state, holder, left in runs]


def _span(rows: Sequence[GpuRow]) -> str:
    """``0-2`` for consecutive whole GPUs, else each label (``0/0,0/1``)."""
    indices = [r.index or 0 for r in rows]
    whole = all(r.mig is None for r in rows)
    if whole and len(indices) > 1 and indices[-1] - indices[0] == len(indices) - 1:
        return f"{indices[0]}-{indices[-1]}"
    return ",".join(r.label for r in rows)


def data_age(node: str, ctx: RowContext) -> Optional[str]:
    """How old a node's data is, when it is old enough to distrust (else None)."""
    sample = ctx.data.samples.get(node)
    if sample is None:
        return None
    age = ctx.clock_now - sample.at
    if age < max(3 * ctx.refresh_s, 5.0):
        return None
    return format_duration(age)


def note_text(row: GpuRow, ctx: RowContext, stale_age: Optional[str]) -> Text:
    text = Text(overflow="ellipsis", no_wrap=True)
    if stale_age is not None:
        text.append(f"⏱ data {stale_age} old · ", style="yellow")
    claim = row.claim
    note = shown_note(claim, ctx.data) if claim is not None else ""
    if row.shares:
        note = row.shares_text  # alice 20G · bob 40G · 20G free
    if note:
        text.append(note)
    service = ctx.data.services.get(claim.job or "") if claim is not None else None
    if service is not None:
        text.append(" · " if note else "", style="dim")
        text.append_text(service_note(service, ctx.data.now))
    held = row.state == GpuState.CLAIMED and claim is not None
    if row.reason and not held and row.state != GpuState.RESERVED:
        if text.plain and not text.plain.endswith("· "):
            text.append(" · ", style="dim")
        text.append(row.reason, style=reason_style(row.state))
    if row.booking is not None:  # the open booking, or the next one within a day
        if text.plain and not text.plain.endswith("· "):
            text.append(" · ", style="dim")
        text.append("📅 " + booking_phrase(row.booking, ctx.data.now), style="cyan")
    if row.state == GpuState.UNREACHABLE and row.index is None:
        sample = ctx.data.samples.get(row.node)
        if sample is not None and sample.last_ok is not None:
            seen = format_duration(ctx.clock_now - sample.last_ok)
            text.append(f" · last seen {seen} ago", style="dim")
    if row.node in ctx.data.view.drains and row.state == GpuState.FREE:
        info = ctx.data.view.drains[row.node]
        reason = f": {info['reason']}" if info.get("reason") else ""
        text.append(f"drained by {info.get('user', '?')}{reason}", style="dim")
    return text


def shown_note(claim: Claim, data: BoardData) -> str:
    """A claim's note, less what the JOB column says: ``run`` notes a job's claim ``job NAME``
    (``job NAME rank N`` on a gang's node, of which ``rank N`` is kept). A job the board does
    not know shows by its id only, so its note, which names it, stays."""
    job = data.jobs.get(claim.job) if claim.job else None
    if job is None:
        return claim.note
    own = f"job {job.name}"
    if claim.note == own:
        return ""
    if claim.note.startswith(own + " rank "):
        return claim.note[len(own) + 1 :]
    return claim.note


def job_text(job_id: Optional[str], data: BoardData) -> Text:
    if not job_id:
        return Text("")
    job = data.jobs.get(job_id)
    if job is None:
        return Text(job_id, style="dim")
    service = data.services.get(job_id)
    if service is not None:
        return service_job_text(service)
    state = data.job_states.get(job_id, job.state)
    if started(state):
        return Text(job.name, style="green")
    return Text(f"{job.name} ({state})", style="bold red" if state == JobState.LOST else "yellow")


def left_text(seconds: float, job: bool = False) -> Text:
    """Time left; none left is ``expired`` for a claim, ``ending`` for a job (its time is up
    and it is being stopped, its claim lasting out the kill grace)."""
    if seconds <= 0:
        return Text("ending" if job else "expired", style="magenta")
    style = "bold red" if seconds < 900 else "yellow" if seconds < 3600 else ""
    return Text(format_duration(seconds), style=style)


def memory_text(used: Optional[int], total: Optional[int], width: int, bar: int) -> Text:
    """``━━━━━━━ 35/80G``: a bar coloured by how full the memory is, and the numbers, in
    ``width`` columns. The numbers are never cut: where ``0.7/80G`` does not fit beside a
    ``bar`` long bar it reads ``1/80G``, and only past that (``100/141G``) the bar gives way."""
    if total is None or total <= 0:
        return Text("n/a" if used is None else f"{used / 1024:.0f}G", style="dim")
    numbers = f"{_gib(used or 0)}/{_gib(total)}G"
    if bar + 1 + len(numbers) > width:
        numbers = f"{(used or 0) / 1024:.0f}/{total / 1024:.0f}G"
    bar = max(1, min(bar, width - 1 - len(numbers)))
    frac = min(1.0, max(0.0, (used or 0) / total))
    filled = round(frac * bar) if frac < 1.0 else bar
    if used and filled == 0:
        filled = 1  # any use at all shows
    colour = "green" if frac < 0.5 else "yellow" if frac < 0.85 else "red"
    text = Text()
    text.append("━" * filled, style=colour)
    text.append("─" * (bar - filled), style="grey37")
    text.append(f" {numbers}")
    return text


def util_text(pct: Optional[int], bar: int = 0) -> Text:
    if pct is None:
        return Text("n/a", style="dim")
    style = "dim" if pct == 0 else "bold" if pct >= 70 else ""
    text = Text()
    if bar:
        filled = round(pct / 100 * bar)
        text.append("━" * filled, style="cyan")
        text.append("─" * (bar - filled), style="grey37")
        text.append(" ")
    text.append(f"{pct:>3}%", style=style)
    return text


_MODEL_NOISE = {"NVIDIA", "GeForce", "HBM3", "HBM3e", "PCIe", "SXM", "SXM4", "SXM5", "NVL"}


def short_model(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB``: the words that tell GPUs apart."""
    words = [w for w in name.split() if w not in _MODEL_NOISE]
    return " ".join(words) or name


def _gib(mib: int) -> str:
    gib = mib / 1024
    return f"{gib:.1f}" if 0 < gib < 9.95 else f"{gib:.0f}"


def summary_text(data: BoardData, filters: Filters, short: bool = False) -> Text:
    """``5/8 GPUs free · 2 claimed · 1 busy-unclaimed · queue 2`` (``short``: fewer words)."""
    numbers: dict[str, int] = {}
    for row in data.view.rows:
        if row.index is not None:
            state = display_state(row, data)
            numbers[state] = numbers.get(state, 0) + 1
    total = sum(numbers.values())
    free = numbers.get(FaceState.FREE, 0)
    text = Text()
    gpus = FaceState.FREE.value if short else "GPUs free"
    text.append(f"{free}/{total} {gpus}", style="bold green" if free else "bold red")
    for state in SUMMARY_STATES:
        if numbers.get(state):
            word = short_word(state) if short else state.value
            text.append(" · ", style="dim")
            text.append(f"{numbers[state]} {word}", style=face_style(state))
    unreachable_nodes = [n for n in data.view.unreachable if not _has_rows(n, data)]
    if unreachable_nodes:
        text.append(" · ", style="dim")
        word = "down" if short else "node(s) unreachable"
        text.append(f"{len(unreachable_nodes)} {word}", style=face_style(FaceState.UNREACHABLE))
    text.append(" · ", style="dim")
    text.append(f"queue {data.queue}", style="yellow" if data.queue else "")
    if filters.active:
        text.append(" · ", style="dim")
        text.append(f"filter {filters.describe()}", style="reverse")
    return text


def _has_rows(node: str, data: BoardData) -> bool:
    return any(r.node == node and r.index is not None for r in data.view.rows)
