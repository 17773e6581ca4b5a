"""Where commands write: rich consoles for stdout and stderr (imported when first printed
to), the wait spinner, and JSON. No typer: ``entry.fast`` prints with these too."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def out() -> Console:
    """stdout: colour only on a terminal (rich honours NO_COLOR); in a pipe, lines are never
    wrapped at 80 columns, so scripts can grep whole rows."""
    console = _console_class()
    if sys.stdout.isatty():
        return console(highlight=False)
    return console(highlight=False, width=240, no_color=True)


def err() -> Console:
    console = _console_class()
    if sys.stderr.isatty():
        return console(stderr=True, highlight=False)
    return console(stderr=True, highlight=False, width=240, no_color=True)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1 here; `gpuclaim status | head` is no failure: main() decides.
            raise BrokenPipeError

        def _render_buffer(self, buffer: Any) -> str:
            # Tables pad every cell to its column's width; in a pipe or a file the padding
            # at the end of a line is only noise for grep, diff and `cut`.
            text = super()._render_buffer(buffer)
            if self.is_terminal:
                return text
            return "\n".join(line.rstrip() for line in text.split("\n"))

    return _Console


def say_on_stderr(quiet: bool = False) -> Callable[[str], None]:
    """What a claim that waits for preemptible jobs tells: a line on stderr (none if quiet)."""

    def say(text: str) -> None:
        if not quiet:
            err().print(f"gpuclaim: {text}", markup=False, highlight=False)

    return say


@contextlib.contextmanager
def waiting(text: str, quiet: bool = False, delay_s: float = 0.5) -> Iterator[None]:
    """A spinner on stderr while a real wait lasts (nodes slow to answer over SSH): only on a
    terminal, never in a pipe, and only once the wait passes ``delay_s``, so that quick
    answers never flash one."""
    if quiet or not sys.stderr.isatty():  # before rich: its import is 40 ms of a look
        yield
        return
    console = err()
    if not console.is_terminal or console.is_dumb_terminal:
        yield
        return
    spinner = console.status(text)
    lock = threading.Lock()
    shown = done = False

    def show() -> None:
        nonlocal shown
        with lock:
            if not done:
                spinner.start()
                shown = True

    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            done = True
            timer.cancel()
            if shown:
                spinner.stop()


LONG_JSON_LIST = 100  # longer lists are printed one compact item per line


def print_json(data: Any) -> None:
    """Indented JSON; a long list one item per line instead (still one JSON document):
    json's C encoder only writes compact JSON, and the indenting one took 1.8 s for the
    rows of 6,000 jobs."""
    if isinstance(data, list) and len(data) > LONG_JSON_LIST:
        items = ",\n".join(json.dumps(item, ensure_ascii=False) for item in data)
        sys.stdout.write(f"[\n{items}\n]\n")
        return
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
