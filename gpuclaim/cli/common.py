"""What every command needs: the loaded config, the store, the user, and output helpers.

The state and the consoles live in modules of their own that do not import typer
(``app_state``, ``console``): the commands answered without typer (``entry.fast``) use them
too. This module adds what is typer's: the global options, ``state(ctx)``, ``-q``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from gpuclaim import __version__
from gpuclaim.cli.app_state import AppState
from gpuclaim.cli.console import LONG_JSON_LIST, err, out, print_json, say_on_stderr, waiting

__all__ = [
    "LONG_JSON_LIST",
    "AppState",
    "err",
    "out",
    "print_json",
    "quiet_option",
    "root",
    "say_on_stderr",
    "state",
    "waiting",
]


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


def quiet_option() -> Any:
    """``-q/--quiet`` for commands that act: the exit code says how it went."""
    return typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")
