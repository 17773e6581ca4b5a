"""What every command needs: the loaded config, the store, the user, and output helpers."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpuclaim import __version__
from gpuclaim.core.identity import current_user

if TYPE_CHECKING:  # imported when used: `gpuclaim --help` must not pay for them
    from rich.console import Console

    from gpuclaim.core.config import Config
    from gpuclaim.engine.cluster import NodeProber
    from gpuclaim.engine.dispatch import QueueReport
    from gpuclaim.engine.launch import NodeOps
    from gpuclaim.store import Store


@dataclass
class AppState:
    """Set by the top-level callback from the global options; loaded lazily."""

    config_path: Optional[Path] = None
    looking: bool = False  # a command that only looks: storage refusing writes is no error
    _refusal_said: bool = field(default=False, repr=False)
    _config: Optional[Config] = field(default=None, repr=False)
    _store: Optional[Store] = field(default=None, repr=False)
    _prober: Optional[NodeProber] = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            from gpuclaim.app.configfile import load_config

            self._config = load_config(self.config_path)
            for warning in self._config.warnings:
                err().print(f"warning: {warning}")
        return self._config

    def finish(self) -> None:
        """After every command: post pending Slack messages, bounded by the short timeout.
        A look at storage that refuses writes says so (once), even if it needed no write."""
        refusal = getattr(self._store, "refusal", None)
        if self.looking and refusal is not None:
            self.refused(refusal)
        if self._config is None or self._store is None or not self._config.slack.webhook_url:
            return
        from gpuclaim.core.errors import GpuclaimError

        try:
            from gpuclaim.engine.notify import deliver

            deliver(self.config, self._store, budget_s=self._config.slack.timeout_s)
        except GpuclaimError:
            pass  # delivery never fails a command; the next one tries again

    @property
    def user(self) -> str:
        return current_user(self.config.user)

    @property
    def prober(self) -> NodeProber:
        """One per process: it holds the SSH connections, reused by every command step."""
        if self._prober is None:
            from gpuclaim.app.wiring import make_prober

            self._prober = make_prober(self.config)
        return self._prober

    @property
    def ops(self) -> NodeOps:
        from gpuclaim.engine.launch import NodeOps

        return NodeOps(self.config, self.prober)

    def dispatch_quietly(self, every: bool = False) -> Optional[QueueReport]:
        """Any gpuclaim call starts queued jobs that now fit: the queue needs no daemon.
        With ``every``, each queued job is judged (why it waits), for a listing."""
        from gpuclaim.core.errors import GpuclaimError, StorageRefusesWrites

        try:
            entries = self.store.queue_entries()
        except GpuclaimError:
            return None  # the command itself reports a broken config or storage
        if not entries:
            return None
        from gpuclaim.engine.dispatch import judge_queue  # here: an empty queue needs none of it

        try:
            return judge_queue(self.config, self.store, self.prober, self.ops, every=every)
        except StorageRefusesWrites as exc:
            self.refused(exc)
        except GpuclaimError as exc:
            err().print(f"warning: could not start queued jobs: {exc}")
        return None

    def refused(self, exc: object) -> None:
        """Say once per command that the storage refuses writes, and what that means here."""
        if not self._refusal_said:
            self._refusal_said = True
            err().print(f"warning: {exc}; showing what it holds, nothing was recorded")

    @contextlib.contextmanager
    def side_work(self) -> Iterator[None]:
        """Work a look does on the way (notices, cursors, samples): best effort when the
        storage refuses writes, said once."""
        from gpuclaim.core.errors import StorageRefusesWrites

        try:
            yield
        except StorageRefusesWrites as exc:
            self.refused(exc)

    @property
    def store(self) -> Store:
        if self._store is None:
            from gpuclaim.app.wiring import open_store

            store = open_store(self.config, self.prober)
            create = self.config.storage_default  # only this machine's own default store
            if self.looking:
                with self.side_work():  # a layout it cannot make: read what is there
                    store.ensure(create=create)
            else:
                store.ensure(create=create)
            self._store = store
        return self._store


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuclaim {__version__}")
        raise typer.Exit()


def _install_completion(ctx: typer.Context, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from gpuclaim.cli.completion import detect_shell, install

    shell = detect_shell()
    path, how = install(shell)
    typer.echo(f"Installed {shell} completion in {path} ({how}); open a new shell to use it.")
    raise typer.Exit()


def _show_completion(ctx: typer.Context, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from gpuclaim.cli.completion import detect_shell, script

    sys.stdout.write(script(detect_shell()))
    raise typer.Exit()


def root(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(
        None, "--config", envvar="GPUCLAIM_CONFIG", help="Config file to use.", show_envvar=True
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
    install_completion: bool = typer.Option(
        False,
        "--install-completion",
        callback=_install_completion,
        is_eager=True,
        expose_value=False,
        help="Install tab completion for your shell (bash, zsh or fish).",
    ),
    show_completion: bool = typer.Option(
        False,
        "--show-completion",
        callback=_show_completion,
        is_eager=True,
        expose_value=False,
        help="Print the completion script for your shell.",
    ),
) -> None:
    """Claim, check and run on a small team's shared GPU servers."""
    ctx.obj = AppState(config_path=config)
    ctx.call_on_close(ctx.obj.finish)


def state(ctx: typer.Context, looking: bool = False) -> AppState:
    """The command's state; ``looking`` for commands that only show (status, jobs, history,
    board, doctor, logs): they answer from what storage that refuses writes still holds."""
    top = ctx.find_root()
    if not isinstance(top.obj, AppState):
        top.obj = AppState()
    if looking:
        top.obj.looking = True
    return top.obj


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


def quiet_option() -> Any:
    """``-q/--quiet`` for commands that act: the exit code says how it went."""
    return typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")
