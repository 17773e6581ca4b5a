"""The board's dialogs: claim, confirm, filter, and the help screen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Optional

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from gpuclaim.board.actions import ClaimForm, clean_note
from gpuclaim.board.cells import face
from gpuclaim.core.durations import format_duration, parse_duration
from gpuclaim.core.errors import GpuclaimError, UsageError
from gpuclaim.core.states import FaceState, face_style

DIALOG_CSS = """
.dialog { width: 64; height: auto; max-width: 100%; max-height: 100%; padding: 0 1;
          background: $surface; border: round $primary; }
.dialog .title { text-style: bold; margin-bottom: 1; }
.dialog .form { grid-size: 2; grid-columns: 12 1fr; grid-rows: 1; grid-gutter: 1 1;
                height: auto; }
.dialog .error { color: $error; height: auto; }
.dialog .buttons { height: auto; margin-top: 1; align-horizontal: right; }
.dialog Button { margin-left: 2; }
"""
ANY_NODE = "*"


class ClaimDialog(ModalScreen[Optional[ClaimForm]]):
    """How many GPUs, where, for how long, and a note for the others."""

    DEFAULT_CSS = "ClaimDialog { align: center middle; }" + DIALOG_CSS
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, nodes: Sequence[str], node: Optional[str], default_time_s: float) -> None:
        super().__init__()
        self.nodes = list(nodes)
        self.node = node
        self.default_time = format_duration(default_time_s)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Claim GPUs", classes="title")
            with Grid(classes="form"):
                yield Label("How many")
                yield Input("1", id="count", type="integer", compact=True)
                yield Label("Node")
                options = [("any node (best fit)", ANY_NODE)] + [(n, n) for n in self.nodes]
                value = self.node or ANY_NODE
                yield Select(options, value=value, allow_blank=False, id="node", compact=True)
                yield Label("How long")
                yield Input(self.default_time, id="time", placeholder="90m, 4h, 2d", compact=True)
                yield Label("Note")
                yield Input("", id="note", placeholder="what it is for", compact=True)
            yield Static("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Claim", id="ok", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#count", Input).focus()

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def submit(self) -> None:
        try:
            form = self._form()
        except GpuclaimError as exc:
            self.query_one("#error", Static).update(str(exc))
            return
        self.dismiss(form)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)

    def _form(self) -> ClaimForm:
        raw = self.query_one("#count", Input).value.strip()
        if not raw.isdigit() or int(raw) < 1:
            raise UsageError("how many GPUs: a whole number, at least 1")
        node = self.query_one("#node", Select).value
        return ClaimForm(
            count=int(raw),
            node=None if node in (ANY_NODE, Select.BLANK) else str(node),
            duration_s=parse_duration(self.query_one("#time", Input).value),
            note=clean_note(self.query_one("#note", Input).value),
        )


class ConfirmDialog(ModalScreen[bool]):
    """Yes or no to an action that changes something for others to see."""

    DEFAULT_CSS = "ConfirmDialog { align: center middle; }" + DIALOG_CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, yes: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question)
            with Horizontal(classes="buttons"):
                yield Button("No (n)", id="no", compact=True)
                yield Button(f"{self.yes} (y)", id="yes", variant="error", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class FilterDialog(ModalScreen[Optional[str]]):
    """Filter by user or node: ``alice``, ``node:node01``, ``user:bob node:node02``."""

    DEFAULT_CSS = "FilterDialog { align: center middle; }" + DIALOG_CSS
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Filter", classes="title")
            yield Label("user names, node:NAME, or both (empty: show all)")
            yield Input(self.current, id="filter", placeholder="alice node:node01", compact=True)

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP_KEYS = (
    ("↑ ↓ PgUp PgDn", "move; the mouse selects and scrolls too"),
    ("c", "claim GPUs (how many, where, how long, note)"),
    ("r", "release your claim on the selected GPU"),
    ("k", "kill your job on the selected GPU"),
    ("l", "show / hide the selected job's log (follows it)"),
    ("a", "attach to your job's tmux session (Ctrl-b d comes back)"),
    ("f", "filter by user or node;  m: only mine;  Esc: clear"),
    ("v", "compact view: one line per node"),
    ("Ctrl-r", "refresh now;  q: quit"),
)

# The faces the help screen lists: every one, so a new face is explained where it appears.
HELP_STATES = tuple(FaceState)


class HelpScreen(ModalScreen[None]):
    """Keys and what the states mean."""

    DEFAULT_CSS = "HelpScreen { align: center middle; }" + DIALOG_CSS.replace(
        "width: 64", "width: 76"
    )
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        text = Text()
        text.append("Keys\n", style="bold")
        for key, what in HELP_KEYS:
            text.append(f" {key:<14}", style="bold cyan")
            text.append(f"{what}\n")
        text.append("\nStates\n", style="bold")
        for state in HELP_STATES:
            look = face(state)
            text.append(f" {look.glyph} {state.value:<15}", style=face_style(state))
            text.append(f"{look.meaning}\n")
        text.append("A ⏱ age marks a node whose data is old (its probe is slow).", style="dim")
        with Vertical(classes="dialog"):
            yield Static(text)

    def action_close(self) -> None:
        self.dismiss(None)
